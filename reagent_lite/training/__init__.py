"""reagent_lite.training"""
