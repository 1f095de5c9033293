"""What a run writes and shows: its folder and metrics rows, metric writers, samples, log streaming and
viewing, the progress line, and pictures."""
