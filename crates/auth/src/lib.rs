//! Service-token JWTs and identity-provider verification. No HTTP.
