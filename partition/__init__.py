"""gnndist.partition"""
