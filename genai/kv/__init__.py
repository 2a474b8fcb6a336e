"""KV-cache layouts: shared and growing buffers (`kv_cache`), caches kept inside the session
(`session_kv_cache`, OpenVINO's stateful mode) and sliding-window caches (`windowed_cache`)."""
