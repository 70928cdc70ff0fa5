"""OpenCue's wire protocol (gRPC), served from a cuectl store: docs/opencue-grpc.md."""
