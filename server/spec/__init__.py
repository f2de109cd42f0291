"""The study spec a user writes (docs/spec.md): its model, the checks that refuse a bad one with
the field and the reason, what the built-in trainer and workloads accept, and advice on a
design."""
