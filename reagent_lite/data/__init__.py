"""reagent_lite.data"""
