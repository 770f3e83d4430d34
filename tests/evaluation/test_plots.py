def test_panel_grids_leave_no_avoidable_blank():
    from divrl.evaluation.plots import _grid

    assert [_grid(n) for n in (1, 2, 3, 4, 5, 6, 9)] == [
        (1, 1),
        (1, 2),
        (1, 3),
        (2, 2),
        (2, 3),
        (2, 3),
        (3, 3),
    ]
