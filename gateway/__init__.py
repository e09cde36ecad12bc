"""The live admission gateway: an OpenAI-compatible reverse proxy with per-tenant admission (docs/gateway.md)."""
