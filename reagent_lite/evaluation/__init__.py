"""reagent_lite.evaluation"""
