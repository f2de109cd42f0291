"""What the dashboard shows: the data of each interactive chart (charts/), the report plots drawn
with matplotlib and the data they need, and the trial table."""
