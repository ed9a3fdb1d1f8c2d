"""One router module per resource: the task endpoints (`tasks`), the OpenAI-compatible chat and
models (`chat`), feedback (`feedback`), adapters and canaries (`adapters`), round history
(`rounds`), statistics (`stats`), health and readiness (`health`), the dashboard page
(`dashboard`) and the review queue and its page (`review`)."""
