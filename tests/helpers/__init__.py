"""What several test modules share: batches, processes, Chromium, verl on CPU."""
