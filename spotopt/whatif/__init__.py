"""What-if cost analysis: replay the price history through the planner."""
