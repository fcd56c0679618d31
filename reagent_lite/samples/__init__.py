"""reagent_lite.samples"""
