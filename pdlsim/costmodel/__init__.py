"""The cost model: a calibrated profile, presets and assumptions answering the simulator's
questions."""
