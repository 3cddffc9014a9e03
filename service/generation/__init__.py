"""A generation while it runs: the job the model thread works on (job.py), the
events it produces (events.py), the check of finished documents
(documents.py), and the prepared request that holds its model lease (run.py)."""
