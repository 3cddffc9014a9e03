"""gRPC servicers: protobuf in, a call on the data plane, protobuf out."""
