"""reagent_lite.trainers"""
