"""What every package of atlas stands on, and nothing about retrieval, reading or tasks: files written
atomically and durably and input errors that name the file, line and field (`common.io`), the typed reading of
the JSON records written beside the data, errors naming the file and the field (`common.json_fields`), where a model is
loaded from and the embedded model packages checked against their recorded hashes (`common.modeling`,
`common.model_packages`), progress bars that stay readable in logs (`common.progress`), the input limits
every front end applies (`common.limits`) and the type rules every config section follows
(`common.config_section`).
The bottom of the tree: imports no other package of the project; `tasks`, `retriever`, `reader` and `atlas`
all may import it."""
