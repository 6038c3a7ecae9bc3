"""Inside the job: one API for every backend. Nothing here is imported on the login side."""
