"""atlas, the system. Core: `config`, `model` (retriever + reader wiring), `build`, `evaluate`,
`distributed`; rooms above it: `training/`, then the front ends `cli/`, `serve/`, `demo/`, `importing/`;
below it: `knnlm/`. May import `tasks`, `retriever`, `reader`; those never import atlas."""
