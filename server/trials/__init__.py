"""A trial's life on the server: leases to workers (claim, heartbeat, complete, fail, the reaper),
on the synchronous and the async path, reading trials, replicas and retries, and the workers'
health reports."""
