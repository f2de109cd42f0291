"""What the server keeps so it need not compute an answer twice: answers about a study in memory
while the study has not changed (memo), and first-screen charts and the analysis kept in the
database per study version (kept)."""
