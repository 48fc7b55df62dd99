"""The model call and what surrounds it: an export loaded and its signatures called by
TensorFlow (`model`; a version's model.tflite with --prefer_tflite_model: `tflite`),
instances in and predictions out (`instances`, `decode`, `loop`, `tensors`), Classify
and Regress over Examples (`inference`), the batch queues (`batching`, their parameters
in `protos`), TFRecord files (`records`), and the one place deciding how a request's
call runs (`calls`)."""
