"""Studies: creating one (the spec checked and its trials laid out in one transaction), reading,
pausing, growing, and the notes people keep on a study or a trial."""
