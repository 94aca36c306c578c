//! Integration tests: each starts the real `hearth` server on ephemeral ports and talks HTTP to it.
