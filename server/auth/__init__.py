"""Who may call what: API tokens with their roles, the trial tokens a worker hands its trial
processes, and the server's signing key."""
