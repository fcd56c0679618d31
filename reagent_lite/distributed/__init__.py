"""reagent_lite.distributed"""
