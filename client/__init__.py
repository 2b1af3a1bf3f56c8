"""Everything a user process needs to talk to a kvlease cluster, and nothing of the servers."""
