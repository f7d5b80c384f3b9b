"""The release of this checkout: a worker of another release than the web is refused."""

VERSION = "0.24.0"
