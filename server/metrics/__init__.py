"""What a trial reports while it runs: metric points ingested in batches, a trial's objective kept
as points arrive, and curves downsampled in the database."""
