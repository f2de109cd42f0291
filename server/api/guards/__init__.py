"""What stands between the network and the routes: the HTTP protocol's deadlines and admission,
text the database cannot keep, body size and the pages' content policy, credentials, uploads in
flight, and a tally that keeps refusals from flooding the log (docs/security.md)."""
