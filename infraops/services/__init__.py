"""Workflows of the core domain, one module per subdomain."""
