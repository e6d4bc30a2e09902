"""OpenAI's request and response shapes, shared by the server and batch jobs: the body
schemas, their translation into a Request, and the responses built from results."""
