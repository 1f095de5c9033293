"""`cadence bench`: measurements that print JSON, never timed tests."""
