"""The served models and their versions: what to serve (`versions`: version policies,
published folders; `config`: model config files), the repository that loads, watches,
labels and unloads versions (`repository`), warmup replayed before a version takes
traffic (`warmup`), sampled request logs (`request_log`) and publishing an export as a
version (`publish`)."""
