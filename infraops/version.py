"""The release this checkout is. Web and workers compare it on every worker request
(X-InfraOps-Version): a worker of another release is refused, not half-understood.

Imports nothing, so a worker, a script or setup tooling reads it cheaply."""

VERSION = "0.24.0"
