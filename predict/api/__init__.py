"""TF Serving's two APIs over the served models: REST (`rest` its routes, `http` the
HTTP plumbing under uvicorn) and gRPC (`grpc_api`, on grpcio's server), their health
(`health`) and metrics (`metrics`). Both reach the models through predict.models and
call them as predict.runtime.calls decides."""
