"""The playbook's incremental tuning loop (docs/rounds.md): pipelines and their rounds, the
evidence for a round's candidate against the baseline and the decision to launch it, and the
recipes that write the study the playbook prescribes next."""
