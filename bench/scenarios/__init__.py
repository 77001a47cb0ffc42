"""One module per scenario, each with `run(work_dir, report)`."""
