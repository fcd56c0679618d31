"""reagent_lite.normalization"""
