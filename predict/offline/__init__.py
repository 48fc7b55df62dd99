"""Prediction without a server: `local` (a few instances, as `gcloud ai-platform local
predict`) and `batch` (files in, results and error stats out, cut into shards by
`shards` for batch prediction jobs' workers, predict.batch_worker)."""
