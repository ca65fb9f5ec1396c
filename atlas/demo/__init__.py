"""The shipped demo: a fictional encyclopedia with questions, the embedded `atlas-reader`, the
quickstart (`quickstart.run_quickstart`) and the scripts that made them. May import all of `atlas`
(it is a front end) and the lower packages."""
