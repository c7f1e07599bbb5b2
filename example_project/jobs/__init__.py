"""The four jobs this project exists for: message cleanup, analytics, session expiry, broadcasts."""
