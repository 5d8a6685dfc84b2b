"""The results collector's parts: runs.py (records and job logs to rows), table.py (pandas table,
speedup, md/csv/json), plots.py (matplotlib figures). The command is qa_hpc.tools.collect_results."""
