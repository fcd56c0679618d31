"""reagent_lite.models"""
