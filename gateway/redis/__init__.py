"""admit.gateway.redis: the Redis backend of the gateway (admission leases, rate envelopes, scripts, metrics)
shared by several replicas."""
