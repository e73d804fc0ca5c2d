// Metrics: the document says "metrics" but never names the folder.
