"""gnndist.samplers"""
