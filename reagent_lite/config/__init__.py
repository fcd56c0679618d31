"""reagent_lite.config"""
