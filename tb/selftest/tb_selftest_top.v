// Self-test top for the tb models: only the DUT's port names, no logic.
// Every signal is an input so cocotb drives both sides (model and stimulus).
`timescale 1ns/1ps
module tb_selftest_top (
    input clk, input rst,
    // m_axi: DMA master (memory model is the slave)
    input [3:0] m_axi_awid, input [63:0] m_axi_awaddr, input [7:0] m_axi_awlen, input [2:0] m_axi_awsize,
    input [1:0] m_axi_awburst, input m_axi_awvalid, input m_axi_awready,
    input [1023:0] m_axi_wdata, input [127:0] m_axi_wstrb, input m_axi_wlast, input m_axi_wvalid, input m_axi_wready,
    input [3:0] m_axi_bid, input [1:0] m_axi_bresp, input m_axi_bvalid, input m_axi_bready,
    input [3:0] m_axi_arid, input [63:0] m_axi_araddr, input [7:0] m_axi_arlen, input [2:0] m_axi_arsize,
    input [1:0] m_axi_arburst, input m_axi_arvalid, input m_axi_arready,
    input [3:0] m_axi_rid, input [1023:0] m_axi_rdata, input [1:0] m_axi_rresp, input m_axi_rlast,
    input m_axi_rvalid, input m_axi_rready,
    // m_axi_rx: second DMA write port (write channels only)
    input [3:0] m_axi_rx_awid, input [63:0] m_axi_rx_awaddr, input [7:0] m_axi_rx_awlen, input [2:0] m_axi_rx_awsize,
    input [1:0] m_axi_rx_awburst, input m_axi_rx_awvalid, input m_axi_rx_awready,
    input [1023:0] m_axi_rx_wdata, input [127:0] m_axi_rx_wstrb, input m_axi_rx_wlast, input m_axi_rx_wvalid,
    input m_axi_rx_wready,
    input [3:0] m_axi_rx_bid, input [1:0] m_axi_rx_bresp, input m_axi_rx_bvalid, input m_axi_rx_bready,
    // m_axis_tx: MAC TX stream (wire model drives tready)
    input [1023:0] m_axis_tx_tdata, input [127:0] m_axis_tx_tkeep, input m_axis_tx_tvalid,
    input m_axis_tx_tready, input m_axis_tx_tlast,
    // s_axil: CSR slave (AxiLiteRam stands in for the NIC)
    input [15:0] s_axil_awaddr, input [2:0] s_axil_awprot, input s_axil_awvalid, input s_axil_awready,
    input [31:0] s_axil_wdata, input [3:0] s_axil_wstrb, input s_axil_wvalid, input s_axil_wready,
    input [1:0] s_axil_bresp, input s_axil_bvalid, input s_axil_bready,
    input [15:0] s_axil_araddr, input [2:0] s_axil_arprot, input s_axil_arvalid, input s_axil_arready,
    input [31:0] s_axil_rdata, input [1:0] s_axil_rresp, input s_axil_rvalid, input s_axil_rready,
    // s_axi_db: doorbell slave, write channels only (AxiRamWrite stands in)
    input [3:0] s_axi_db_awid, input [31:0] s_axi_db_awaddr, input [7:0] s_axi_db_awlen, input [2:0] s_axi_db_awsize,
    input [1:0] s_axi_db_awburst, input s_axi_db_awvalid, input s_axi_db_awready,
    input [63:0] s_axi_db_wdata, input [7:0] s_axi_db_wstrb, input s_axi_db_wlast, input s_axi_db_wvalid,
    input s_axi_db_wready,
    input [3:0] s_axi_db_bid, input [1:0] s_axi_db_bresp, input s_axi_db_bvalid, input s_axi_db_bready
);
endmodule
