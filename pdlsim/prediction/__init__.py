"""Predicting a configuration: its settings, the simulation, the band and the document printed."""
