"""Reading: every dump format (flightrec, PyTorch pickle and JSON, torchcomms, torch_npu) into one entry table and per-rank records."""
