"""`python -m timekeeper.scheduler`: the periodic jobs (timekeeper/periodic/) in a process of their own."""
