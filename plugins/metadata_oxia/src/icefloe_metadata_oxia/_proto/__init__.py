"""Generated Oxia protocol messages (see ``proto/generate.sh``)."""
