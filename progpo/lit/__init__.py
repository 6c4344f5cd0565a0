"""Lightning as a thin shell around ``progpo.algo``: the module, the DataModule, the callbacks."""
