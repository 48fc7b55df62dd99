"""Reading the jobs of the local index and what they wrote, for the commands, the console
and the Python API alike: gcloud's `--filter` language (`filter_expr`), `jobs list`'s
selection, sort and limit (`listing`), and a job's curves from its own TensorBoard
summaries (`curves`). It imports nothing above the records."""
