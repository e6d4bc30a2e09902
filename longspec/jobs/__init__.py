"""Work past one request: batch jobs over JSONL lines, the resumable sidecar of a run written
to a file, and Ray (batch lines spread over actors, the server as Ray Serve replicas)."""
