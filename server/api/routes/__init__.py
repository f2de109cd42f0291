"""The HTTP routes, thin: each validates its input, calls one service function and returns a schema
(docs/api.md)."""
